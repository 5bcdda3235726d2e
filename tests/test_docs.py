"""The README and docs/ cannot drift from the product: what they show is run or checked here.

Convention: a fenced block opened with ```` ```bash runnable ```` is run as it stands, with
``bash -eu``, in a fresh directory holding a few stand-in files (``path/to/train.py``, a
three-step CPU training loop; ``my_script.py``; a NeMo-like trainer path), with the test venv's ``autoalloc`` first on
``PATH`` and an empty home, so it must exit 0. Only cheap commands are marked runnable
(``explain``, ``doctor``, ``init``, ``check``, ``report``); commands that need a GPU or run
long are shown in plain ```` ```bash ```` blocks. Every ``autoalloc`` command line shown
anywhere (a line of a ``bash``/``sh``/``console`` block, a ``$ `` line of any block, or an
inline code span starting with ``autoalloc ``) must at least parse with the CLI's own
argparse parsers, every ```` ```toml ```` block must be a policy with no mistake in it, and
every relative link must point at a file that exists. The pages are the README, ``docs/``,
the measurement records of ``benchmarks/results/`` and ``tests/README.md``. The module map of docs/development.md
names every module and data file of the package, and nothing else.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autoalloc import cli
from autoalloc.policy import Source, salvage
from autoalloc.sources import parse_toml
from tests.helpers import REPO, clean_env

PAGES = [
    REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "benchmarks" / "results").glob("*.md")), REPO / "tests" / "README.md",
]
FENCE = re.compile(r"^```(.*)$")
SHELLS = ("bash", "sh", "shell", "console")
TRAIN = """\
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
"""
STAND_INS = {
    "path/to/train.py": TRAIN,
    "my_script.py": "import torch\n",
    "NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py": "import torch\n",
}


def blocks(page: Path) -> list[tuple[int, str, str]]:
    """(line number, info string, text) of each fenced block of a Markdown page."""
    out, info, start, body = [], None, 0, []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence and info is None:
            info, start, body = fence.group(1).strip(), number, []
        elif line.startswith("```") and info is not None:
            out.append((start, info, "\n".join(body) + "\n"))
            info = None
        elif info is not None:
            body.append(line)
    assert info is None, f"{page}: unclosed fence at line {start}"
    return out


def _all_blocks() -> list[tuple[Path, int, str, str]]:
    return [(page, n, info, text) for page in PAGES for n, info, text in blocks(page)]


def _id(page: Path, line: int) -> str:
    return f"{page.relative_to(REPO)}:{line}"


RUNNABLE = [(p, n, t) for p, n, info, t in _all_blocks() if info.split() == ["bash", "runnable"]]
TOML = [(p, n, t) for p, n, info, t in _all_blocks() if info == "toml"]


def test_the_readme_reads_in_two_minutes() -> None:
    # the reference lives in docs/; the README keeps what a newcomer needs, in that order
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text) < 10_000
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings == [
        "Install", "What is matched out of the box", "Configure", "Commands", "Caveats",
        "Development",
    ]


def test_the_docs_have_runnable_blocks() -> None:
    assert {p.name for p, _, _ in RUNNABLE} >= {"README.md", "commands.md"}


@pytest.mark.parametrize(
    ("page", "line", "text"), RUNNABLE, ids=[_id(p, n) for p, n, _ in RUNNABLE]
)
def test_runnable_block(tmp_path: Path, page: Path, line: int, text: str) -> None:
    for relpath, content in STAND_INS.items():
        (tmp_path / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relpath).write_text(content)
    (tmp_path / "home").mkdir()
    env = clean_env(tmp_path)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    result = subprocess.run(
        ["bash", "-euc", text], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"{_id(page, line)}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr


# -- every shown command parses -----------------------------------------------------------------


def command_lines() -> list[tuple[str, str]]:
    """(where, command line) of every autoalloc command the pages show."""
    found = []
    for page, start, info, text in _all_blocks():
        shell = (info.split() or [""])[0] in SHELLS
        for offset, line in enumerate(text.splitlines(), 1):
            if line.startswith("$ "):
                line = line[2:]
            elif not shell:
                continue
            found.append((_id(page, start + offset), line))
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        for span in re.findall(r"`([^`\n]+)`", prose):
            if span.startswith(("autoalloc ", "python -m autoalloc ")):
                found.append((f"{page.relative_to(REPO)} (inline)", span))
    # "python -m autoalloc ..." stands for any command, not one
    return [(where, line) for where, line in found if (_autoalloc_argv(line) or ["..."]) != ["..."]]


def _autoalloc_argv(line: str) -> list[str] | None:
    """The arguments after ``autoalloc`` (or ``python -m autoalloc``) in a shell line, or None."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    for stop, word in enumerate(words):  # the first command of a pipeline or a list
        if word in ("|", "||", "&&", ";", ">", ">>", "2>", "<"):
            words = words[:stop]
            break
    while words and re.match(r"[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value prefixes
        words = words[1:]
    if words[:1] == ["autoalloc"]:
        return words[1:]
    if words[:3] == ["python", "-m", "autoalloc"]:
        return words[3:]
    return None


COMMANDS = command_lines()


def test_the_docs_show_commands() -> None:
    shown = {(_autoalloc_argv(line) or [""])[0] for _, line in COMMANDS}
    assert shown >= {"explain", "doctor", "init", "check", "ab", "report", "bench", "cache"}


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_shown_command_parses(where: str, line: str) -> None:
    argv = _autoalloc_argv(line)
    assert argv is not None
    try:
        args = cli.parser().parse_args(argv)
    except SystemExit as exc:  # --help and --version exit 0; a wrong command line exits 2
        assert exc.code == 0, f"{where}: {line}"
        return
    if args.cmd == "ab":  # inline, `autoalloc ab` names the command; a block shows one
        assert args.command or "inline" in where, f"{where}: {line}"


# -- every policy example is valid --------------------------------------------------------------


@pytest.mark.parametrize(("page", "line", "text"), TOML, ids=[_id(p, n) for p, n, _ in TOML])
def test_policy_example_is_valid(page: Path, line: int, text: str) -> None:
    table = parse_toml(text.encode())
    if "tool" in table:
        table = table["tool"]["autoalloc"]
    _, problems = salvage(table, Source("user", str(page)), allow_trust=True)
    assert problems == (), f"{_id(page, line)}: {problems}"


# -- links --------------------------------------------------------------------------------------


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of a page."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if "://" in target:
            continue
        path = page.parent / target if target else page
        assert path.exists(), f"{page.relative_to(REPO)}: {target}"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{page.relative_to(REPO)}: {target}#{anchor}"


# -- warning filters ----------------------------------------------------------------------------

WARNING_FILTER = re.compile(r"(?:-W\s+|PYTHONWARNINGS=)[\"']?([^\s`\"')]+)")


def warning_filters() -> list[tuple[str, str]]:
    """(pages, filter) of every ``-W`` option and ``PYTHONWARNINGS`` value the pages show."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for value in WARNING_FILTER.findall(page.read_text(encoding="utf-8")):
            found.setdefault(value, []).append(page.name)
    return sorted((" ".join(sorted(set(pages))), value) for value, pages in found.items())


FILTERS = warning_filters()


def test_the_docs_say_how_to_silence_autoalloc() -> None:
    named = {value for _, value in FILTERS if "autoalloc" in value.lower()}
    assert named == {"ignore:autoalloc"}, FILTERS  # one form, everywhere


@pytest.mark.parametrize(("where", "value"), FILTERS, ids=[v for _, v in FILTERS])
def test_shown_warning_filter_works(tmp_path: Path, where: str, value: str) -> None:
    """Python accepts the filter as given (-W and PYTHONWARNINGS alike), and it silences an
    autoalloc warning exactly when it names autoalloc or ignores everything."""
    (tmp_path / "home").mkdir()
    warn = "from autoalloc.messages import warn; warn('a policy file has a mistake')"
    # -W error: autoalloc's advice never becomes an exception (the warning is dropped instead)
    silenced = "autoalloc" in value.lower() or value in ("ignore", "error")
    for flag, extra in ((["-W", value], {}), ([], {"PYTHONWARNINGS": value})):
        result = subprocess.run(
            [sys.executable, *flag, "-c", warn], cwd=tmp_path, env={**clean_env(tmp_path), **extra},
            capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "Invalid -W option" not in result.stderr, f"{where}: {value}: {result.stderr}"
        said = "AutoallocWarning: autoalloc: a policy file has a mistake" in result.stderr
        assert said is not silenced, f"{where}: {value}: {result.stderr}"


# -- the module map of docs/development.md ------------------------------------------------------

DEVELOPMENT = REPO / "docs" / "development.md"
PACKAGE = REPO / "autoalloc"
# An entry of the map: four spaces, the name, then two spaces or more (its job) or the line's end.
MAP_ENTRY = re.compile(r"^ {4}([\w./]+)(?= {2,}|$)", flags=re.M)


def module_map() -> set[str]:
    """The names the module map lists: the first fenced block after its heading."""
    lines = DEVELOPMENT.read_text(encoding="utf-8").splitlines()
    heading = lines.index("### Module map") + 1  # blocks() counts lines from 1
    text = next(text for start, _, text in blocks(DEVELOPMENT) if start > heading)
    return set(MAP_ENTRY.findall(text))


def package_files() -> set[str]:
    """Every module and data file of the package, named as the map names them: ``layercache``,
    ``ab/recorder``, ``bench/__main__``, ``builtin.toml``, ``builtin.json``."""
    return {
        path.relative_to(PACKAGE).as_posix().removesuffix(".py")
        for path in PACKAGE.rglob("*")
        if path.suffix in (".py", ".toml", ".json") and "__pycache__" not in path.parts
    }


def test_the_module_map_names_every_module() -> None:
    missing = sorted(package_files() - module_map())
    assert missing == [], f"docs/development.md's module map does not name {missing}"


def test_the_module_map_names_what_exists() -> None:
    """Nothing removed or renamed stays on the map (its root entries: files of the checkout)."""
    listed = module_map()
    gone = sorted(name for name in listed - package_files() if not (REPO / name).is_file())
    assert gone == [], f"docs/development.md's module map names what does not exist: {gone}"
