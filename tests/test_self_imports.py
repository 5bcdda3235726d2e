"""A module autoalloc itself imports to decide (json, tomllib, platformdirs...) can never
trigger an ``imports`` rule: ``check`` and ``explain`` say so, the hook traces it, and the
list they use covers what the decision really imports (real torch, the real hook)."""

from __future__ import annotations

import json

from autoalloc.selfimports import SELF_IMPORTS, never_triggers
from tests.helpers import Sandbox, assert_applied, assert_untouched

POLICY = """\
[[rules]]
name = "by-json"
imports = ["json", "mytoolkit.asr"]
"""

SCRIPT = """
import torch
import json
from autoalloc import hook
print("OWN " + json.dumps(sorted(hook.STATE.own)))
"""


def test_a_module_autoalloc_imports_never_triggers_and_the_list_covers_them(
    sandbox: Sandbox,
) -> None:
    sandbox.write("autoalloc.toml", POLICY)
    script = sandbox.script("train.py", SCRIPT)
    result = sandbox.run([str(script)], env={"AUTOALLOC_DEBUG": "1"})
    assert_untouched(result)  # the program imported json after torch: nothing fired
    assert "imports ['json'] cannot trigger: autoalloc imported them" in result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("OWN ")]
    own = {m for m in json.loads(line[4:]) if m.split(".")[0] != "autoalloc"}
    assert own <= SELF_IMPORTS, sorted(own - SELF_IMPORTS)


def test_check_and_explain_name_the_rule(sandbox: Sandbox) -> None:
    sandbox.write("autoalloc.toml", POLICY)
    check = sandbox.run(["-m", "autoalloc", "check", "autoalloc.toml"])
    assert check.returncode == 1
    assert "rule by-json: imports 'json' can never trigger it" in check.stdout
    assert "mytoolkit" not in check.stdout  # a module of the program is fine
    sandbox.write("train.py", "")
    explain = sandbox.run(["-m", "autoalloc", "explain", "--", "python", "train.py"])
    assert "warning:      rule by-json: imports 'json' can never trigger it" in explain.stdout
    watching = [x for x in explain.stdout.splitlines() if x.startswith("watching:")]
    assert watching and "json" not in watching[0]  # what can never fire is not watched
    # ... nor named on the decision line: the rule waits for the program's module only,
    assert "\n  by-json: imports one of mytoolkit.asr\n" in explain.stdout
    # and a rule that only such modules can trigger is not a late decision at all.
    sandbox.write("autoalloc.toml", POLICY.replace(', "mytoolkit.asr"', ""))
    explain = sandbox.run(["-m", "autoalloc", "explain", "--", "python", "train.py"])
    decision = explain.stdout.split("\nwatching:")[0].split("\nwarning:")[0]
    assert "rule by-json: imports 'json' can never trigger it" in explain.stdout
    assert "by-json" not in decision, decision


def test_never_triggers() -> None:
    assert never_triggers(["json", "tomllib", "platformdirs", "nemo.collections.asr"]) == [
        "json",
        "tomllib",
        "platformdirs",
    ]
    assert never_triggers(["json.tool", "autoalloc.hook", "wave"]) == ["autoalloc.hook"]


def test_check_and_explain_name_every_import_list_that_names_such_a_module(
    sandbox: Sandbox,
) -> None:
    """``also_imports``, ``not_imports`` and ``not_imports_unless`` are as dead as ``imports``
    when they name a module autoalloc imports: the program's import of it is never seen."""
    sandbox.write("autoalloc.toml", """\
[[rules]]
name = "lists"
imports = ["mytoolkit.asr"]
also_imports = ["re", "mytoolkit.ctc"]
not_imports = ["tomllib"]
not_imports_unless = ["platformdirs"]
""")
    check = sandbox.run(["-m", "autoalloc", "check", "autoalloc.toml"])
    assert check.returncode == 1
    for named in (
        "also_imports 're' can never complete its imports trigger",
        "not_imports 'tomllib' can never keep it from applying",
        "not_imports_unless 'platformdirs' can never outweigh its not_imports",
    ):
        assert f"rule lists: {named}" in check.stdout
    assert "mytoolkit" not in check.stdout
    sandbox.script("train.py", "import torch\n")
    explain = sandbox.run(["-m", "autoalloc", "explain", "--json", "--", "python", "train.py"])
    assert len(json.loads(explain.stdout)["never_triggers"]) == 3, explain.stdout


# The program's main thread imports torch; while autoalloc decides (paused, deterministically,
# at the execution of autoalloc.hook, after the program's modules were counted), another thread
# of the program imports the trigger. Blocking in exec_module, not in find_spec: importlib holds
# its global lock around find_spec, where the other thread's import would wait for it.
THREADED = """
import sys, threading
from importlib.machinery import PathFinder

go, done = threading.Event(), threading.Event()

class Paused:
    def __init__(self, loader):
        self.loader = loader
    def create_module(self, spec):
        return self.loader.create_module(spec)
    def exec_module(self, module):
        go.set()
        assert done.wait(60)
        self.loader.exec_module(module)

class Gate:
    def find_spec(self, name, path=None, target=None):
        if name != "autoalloc.hook" or go.is_set():
            return None
        if threading.current_thread() is not threading.main_thread():
            return None
        spec = PathFinder.find_spec(name, path)
        spec.loader = Paused(spec.loader)
        return spec

def other():
    assert go.wait(60)
    import asrkit
    done.set()

sys.meta_path.insert(0, Gate())
thread = threading.Thread(target=other)
thread.start()
import torch
thread.join()
from autoalloc import hook
print("PAUSED " + str(go.is_set() and "asrkit" not in hook.STATE.own))
"""


def test_a_module_another_thread_imports_while_autoalloc_decides_is_the_programs(
    sandbox: Sandbox,
) -> None:
    sandbox.write("autoalloc.toml", '[[rules]]\nname = "kit"\nimports = ["asrkit"]\n')
    site = sandbox.write(sandbox.root / "site" / "asrkit" / "__init__.py", "").parent.parent
    script = sandbox.script("train.py", THREADED)
    result = sandbox.run([str(script)], env={"PYTHONPATH": str(site)})
    assert_applied(result, "kit")  # the trigger fired: its import was the program's
    assert "PAUSED True" in result.stdout
