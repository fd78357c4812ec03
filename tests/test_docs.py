"""The README and the documentation site are checked like code.

- The site builds with ``mkdocs build --strict``: a broken link, a missing anchor or a page left
  out of the navigation fails the test.
- ``docs/reference/cli.md`` is what cli's argument parser says now (``docs/gen_cli.py --check``).
- Every command in a fenced ``sh`` block of the README and of ``docs/`` runs as written: each
  page's ``dtrain-tui`` commands run in order in a scratch directory of their own (profiles and
  runs there too, nothing of the user's touched) and must exit 0; ``make`` targets must exist;
  benchmark scripts must exist. A command that cannot run here is in ``SKIP`` with the reason,
  and every entry of ``SKIP`` must still name a command (so the list cannot rot).

Output blocks are fenced ``text`` (or bare), never ``sh``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
DTRAIN = re.compile(r"^(?:\.venv/bin/)?dtrain-tui(?:\s|$)")
COMMAND_TIMEOUT_S = 300

# (page, the command or the words it starts with, comment left out) -> why it is not run here.
SKIP: dict[tuple[str, str], str] = {
    (
        "docs/wizard.md",
        "dtrain-tui",
    ): "opens the TUI, which needs a terminal (tests/tui drive it with Pilot)",
    ("docs/profiles.md", "dtrain-tui --profile local-cpu-demo"): "opens the TUI (tests/tui)",
    (
        "docs/getting-started.md",
        ".venv/bin/dtrain-tui launch",
    ): "a real training run: the README's tour runs the same one",
    (
        "docs/getting-started.md",
        ".venv/bin/dtrain-tui monitor",
    ): "reads the run of the launch above",
    (
        "docs/monitor.md",
        "dtrain-tui launch",
    ): "real runs (one hangs on purpose): the README's tour and tests/e2e run them",
    ("docs/monitor.md", "dtrain-tui monitor runs/demo"): "the TUI, or the run of the launch above",
    (
        "docs/launch/index.md",
        "dtrain-tui launch",
    ): "a real training run: the README's tour runs one",
    (
        "docs/launch/local.md",
        "dtrain-tui launch",
    ): "a real training run: the README's tour runs one",
    (
        "docs/launch/slurm.md",
        "dtrain-tui launch",
    ): "needs a Slurm cluster (tests/e2e start a real two-node one)",
    ("docs/launch/slurm.md", "dtrain-tui monitor"): "reads the Slurm run above",
    (
        "docs/launch/ssh.md",
        "dtrain-tui launch",
    ): "needs SSH to four GPU nodes (tests/e2e start real sshd on 127.0.0.1)",
    (
        "docs/calibrate.md",
        ".venv/bin/dtrain-tui launch",
    ): "a real training run: the README's tour runs one",
    (
        "docs/calibrate.md",
        ".venv/bin/dtrain-tui calibrate",
    ): "reads the run above (the README's tour calibrates its own)",
    ("docs/calibrate.md", ".venv/bin/dtrain-tui plan"): "uses the calibration saved above",
    (
        "docs/preflight.md",
        "dtrain-tui preflight",
    ): "needs the bundle B of Launching; the README's tour runs a preflight",
}


def commands(page: Path) -> list[str]:
    """Every command of the page's ``sh`` blocks, continuation lines joined."""
    found: list[str] = []
    for block in SH_BLOCK.findall(page.read_text()):
        found += [c.strip() for c in re.sub(r"\\\n\s*", "", block).splitlines() if c.strip()]
    return found


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def bare(command: str) -> str:
    """The command without a trailing shell comment."""
    return re.sub(r"\s+#.*$", "", command).strip()


def _starts(command: str, start: str) -> bool:
    return bare(command) == start or bare(command).startswith(start + " ")


def skipped(page: Path, command: str) -> str | None:
    return next(
        (why for (p, start), why in SKIP.items() if p == _name(page) and _starts(command, start)),
        None,
    )


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def test_the_site_builds_strict(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",  # not --quiet: a quiet build does not count its warnings, so never fails
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def test_the_cli_reference_is_what_the_parser_says() -> None:
    r = subprocess.run(
        [sys.executable, "docs/gen_cli.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert r.returncode == 0, r.stderr


def test_the_readme_is_short_and_shows_the_app() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first = commands(ROOT / "README.md")[:2]
    assert [bare(c) for c in first] == ["make run", "make test"]
    for svg in re.findall(r"\]\((docs/images/[\w-]+\.svg)\)", text) or ["(none)"]:
        assert (ROOT / svg).is_file(), f"README shows {svg}, which does not exist"
    assert len(re.findall(r"\]\(docs/images/[\w-]+\.svg\)", text)) >= 2


def test_every_skip_names_a_command() -> None:
    every = {(_name(p), c) for p in PAGES for c in commands(p)}
    stale = [key for key in SKIP if not any(p == key[0] and _starts(c, key[1]) for p, c in every)]
    assert not stale, f"SKIP entries that name no command any more: {stale}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_the_pages_commands_run_as_written(page: Path, tmp_path: Path) -> None:
    cmds = commands(page)
    if not cmds:
        pytest.skip("no sh block")
    venv = Path(sys.executable).parent
    if not (venv / "dtrain-tui").exists():
        pytest.fail(f"{venv}/dtrain-tui is missing: install the package (make install)")
    (tmp_path / ".venv").symlink_to(venv.parent)
    for name in ("tests", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {
        **os.environ,
        "PATH": f"{venv}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path / "home"),
        "DTRAIN_CONFIG_DIR": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"),
    }
    targets = _make_targets()
    for cmd in cmds:
        if cmd.startswith("make "):
            target = bare(cmd).split()[1]
            assert target in targets, (
                f"{_name(page)}: `{cmd}`: the Makefile has no target {target!r}"
            )
            continue
        if cmd.startswith(".venv/bin/python benchmarks/"):
            assert (ROOT / cmd.split()[1]).is_file(), f"{_name(page)}: `{cmd}`: no such script"
            continue
        assert DTRAIN.match(cmd), (
            f"{_name(page)}: `{cmd}` is neither dtrain-tui, make nor a benchmark"
        )
        if skipped(page, cmd):
            continue
        r = subprocess.run(
            ["bash", "-c", cmd],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        assert r.returncode == 0, (
            f"{_name(page)}: `{cmd}` exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        )
