"""The architecture checks themselves: they find what they are for, and the tree passes them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import grimp
import pytest

from tests.architecture import import_cycles, oversized

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["cli", "tui", "profiles", "engine"]


def _package(tmp_path: Path, files: dict[str, str]) -> None:
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))


def test_a_deferred_import_circle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(
        tmp_path,
        {
            "a.py": "from circ import b\n",
            "b.py": "def f():\n    from circ import c\n",
            "c.py": "import circ.a\n",
            "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circ import a\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circ", exclude_type_checking_imports=True, cache_dir=None)
    assert import_cycles(graph, ["circ"]) == [["circ.a", "circ.b", "circ.c"]]


def test_the_project_has_no_import_circle() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)
    assert import_cycles(graph, PACKAGES) == []


def test_lint_imports_runs_the_circle_contract() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert "No import circle between files" in out.stdout, out.stdout + out.stderr


def test_an_oversized_function_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    (tmp_path / "pkg" / "m.py").write_text(f"def long():\n{body}\n")
    assert [line.split()[1] for line in oversized(tmp_path, ["pkg"])] == ["long"]


def test_no_class_or_function_past_the_size_limits() -> None:
    assert oversized(ROOT, PACKAGES) == []
