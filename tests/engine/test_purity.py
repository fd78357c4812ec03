"""``engine`` is the headless core: importing any of its modules must not pull in the TUI stack
(textual, rich) or the heavy runtime (torch, deepspeed, sky, paramiko) -- start-up speed and
``plan --json``'s half-second budget depend on it. Each module is imported in a fresh interpreter.

``engine/trainer/`` is excluded: it is a directory of scripts meant to run under torch on the
training nodes (``train.py``), not a module the app imports.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import engine

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("textual", "rich", "torch", "deepspeed", "sky", "paramiko")
# The layers above engine (cli, tui, profiles) count too: engine never reaches up.
FORBIDDEN = (*HEAVY, "cli", "tui", "profiles")
# engine.trainer: scripts run under torch on the nodes.
EXCLUDED = ("engine.trainer",)

# One interpreter per run; each module is imported in its own forked child of it, so one module's
# imports cannot hide another's. To save time the parent pre-imports pydantic and the shared base
# (engine.plan.specs, engine.plan.result), checking that nothing forbidden came with them.
_PROBE = """
import importlib, json, os, sys
FORBIDDEN = set(%r)
def bad_roots():
    return sorted({m.split('.')[0] for m in sys.modules} & FORBIDDEN)
assert not bad_roots(), bad_roots()
import pydantic  # noqa: F401
import engine.plan.specs, engine.plan.result  # noqa: F401,E401
assert not bad_roots(), bad_roots()
out = {}
for name in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            msg = json.dumps(bad_roots())
        except BaseException as e:  # report, do not hide
            msg = json.dumps(["import failed: %%s: %%s" %% (type(e).__name__, e)])
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out[name] = json.loads(data.decode() or '["child died"]')
print(json.dumps(out))
"""


def engine_modules() -> list[str]:
    names = ["engine"]
    for info in pkgutil.walk_packages(engine.__path__, prefix="engine."):
        if info.name.startswith(EXCLUDED):
            continue
        names.append(info.name)
    return sorted(names)


def test_walk_finds_the_core_modules() -> None:
    names = engine_modules()
    for must in (
        "engine.plan.specs",
        "engine.plan.memory",
        "engine.plan.perf",
        "engine.plan.planner",
        "engine.write.bundle",
        "engine.launch.base",
        "engine.monitor.tail",
    ):
        assert must in names
    assert not any(n.startswith("engine.trainer") for n in names)


def _probe(names: list[str]) -> dict[str, list[str]]:
    r = subprocess.run(
        [sys.executable, "-c", _PROBE % (FORBIDDEN,), *names],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data: dict[str, list[str]] = json.loads(r.stdout.strip().splitlines()[-1])
    return data


def test_no_engine_module_imports_ui_or_heavy_runtime() -> None:
    names = engine_modules()
    result = _probe(names)
    assert set(result) == set(names)
    offenders = {name: bad for name, bad in result.items() if bad}
    assert not offenders, f"engine modules importing forbidden packages: {offenders}"


def test_the_probe_can_fail() -> None:
    """The same probe flags a module that does import a forbidden package, and one that fails."""
    result = _probe(["rich.text", "engine.no_such_module"])
    assert result["rich.text"] == ["rich"]
    assert result["engine.no_such_module"][0].startswith("import failed")


def test_planning_from_the_cli_imports_no_torch() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['plan', '--model', 'llama-2-7b', '--gpu', 'h100', '--gpus-per-node', '8', '--json'])\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({(*HEAVY, 'tui')!r})), rc)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[] 0"
